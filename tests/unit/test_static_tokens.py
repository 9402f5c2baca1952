"""`--token-auth-file`'s tokens: each names its service account, nothing else passes, and a
call costs the same whatever the file's size.

A caller needs no valid token to have pilot review the one it sends, so the work
of a review must not grow with the file: a file of 20,000 tokens (0.8 MiB, near
the file's bound) is reviewed with at most one constant-time comparison a call,
for a token it holds and for one it does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pilot.security import static_tokens
from pilot.security.authn import AuthError
from pilot.security.certs import write_private
from pilot.security.static_tokens import load_token_file

TOKENS = 20_000


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    lines = [f"t{i:05d}x,system:serviceaccount:n{i % 50}:s{i}\n" for i in range(TOKENS)]
    path = tmp_path / "tokens.csv"
    write_private(path, "".join(lines).encode())
    return path


@pytest.fixture
def comparisons(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many constant-time comparisons the reviewer makes, counted."""
    made: list[int] = []
    compare = static_tokens.hmac.compare_digest

    def counted(a: bytes, b: bytes) -> bool:
        made.append(1)
        return compare(a, b)

    monkeypatch.setattr(static_tokens.hmac, "compare_digest", counted)
    return made


async def test_each_token_names_its_service_account(token_file: Path) -> None:
    reviewer = load_token_file(token_file, "cluster.local")
    assert len(reviewer) == TOKENS
    for i in (0, 1, 4_999, TOKENS - 1):
        user = await reviewer.review(f"t{i:05d}x", ["istio-ca"])
        assert user == f"system:serviceaccount:n{i % 50}:s{i}"


@pytest.mark.parametrize(
    "presented",
    ["t00001", "t00001x ", "", "T00001X", "t00001xt00002x", "nothing like it"],
)
async def test_a_token_not_in_the_file_is_rejected(token_file: Path, presented: str) -> None:
    reviewer = load_token_file(token_file, "cluster.local")
    with pytest.raises(AuthError, match=r"^token rejected: not in --token-auth-file$"):
        await reviewer.review(presented, ["istio-ca"])


async def test_a_review_costs_the_same_whatever_the_files_size(
    token_file: Path, comparisons: list[int]
) -> None:
    reviewer = load_token_file(token_file, "cluster.local")
    await reviewer.review("t12345x", ["istio-ca"])
    assert len(comparisons) <= 1
    comparisons.clear()
    with pytest.raises(AuthError):
        await reviewer.review("a token no one issued", ["istio-ca"])
    assert len(comparisons) <= 1, "a wrong token was compared with every token in the file"
