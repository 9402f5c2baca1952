"""`write_kubeconfig`: an ordinary kubeconfig file pointing at a test API server.

Owns only the file format (clusters/users/contexts/current-context, plain http),
so that code under test loads it with the stock kubeconfig loader.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

CONTEXT_NAME = "kubeapi-test"


def kubeconfig_dict(
    server_url: str, token: str | None = None, namespace: str = "default"
) -> dict[str, Any]:
    """The kubeconfig document as a dict."""
    user: dict[str, Any] = {"token": token} if token else {}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": CONTEXT_NAME, "cluster": {"server": server_url}}],
        "users": [{"name": CONTEXT_NAME, "user": user}],
        "contexts": [
            {
                "name": CONTEXT_NAME,
                "context": {"cluster": CONTEXT_NAME, "user": CONTEXT_NAME, "namespace": namespace},
            }
        ],
        "current-context": CONTEXT_NAME,
    }


def write_kubeconfig(
    path: str | os.PathLike[str],
    server_url: str,
    token: str | None = None,
    namespace: str = "default",
) -> Path:
    """Write a kubeconfig for server_url (bearer token if given) to path; returns path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(kubeconfig_dict(server_url, token, namespace), sort_keys=False)
    target.write_text(text, encoding="utf-8")
    return target
