"""The real control plane, once per test run; Istio's CRDs and deploy/ applied on it
(`deployed`, once); a namespace of its own per test (and a second one, for its
clients, where it asks)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.control_plane import (
    REPO,
    ControlPlane,
    build_binaries,
    running_control_plane,
)

HERE = Path(__file__).parent


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the binaries before any test runs when this tier is collected: the first
    build takes minutes, longer than a test's timeout; afterwards it is a cache hit."""
    if any(HERE in Path(item.path).parents for item in session.items):
        build_binaries()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with running_control_plane(tmp_path_factory.mktemp("kubernetes")) as plane:
        yield plane


def _own_namespace(plane: ControlPlane) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    plane.kubectl("create", "namespace", name)
    yield name
    plane.kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A namespace for this test alone, deleted after it."""
    yield from _own_namespace(control_plane)


@pytest.fixture
def client_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A second namespace for this test alone (its clients', beside `namespace`)."""
    yield from _own_namespace(control_plane)


@pytest.fixture(scope="session")
def deployed(control_plane: ControlPlane) -> ControlPlane:
    """Istio's CRDs and deploy/ applied as a user would (`kubectl apply -k deploy/`):
    pilot's namespace, ServiceAccount and RBAC are there (its Pods stay Pending)."""
    plane = control_plane
    plane.kubectl("apply", "--server-side", "-f", str(plane.crds))
    plane.kubectl("wait", "--for=condition=established", "--timeout=60s", "crd", "--all")
    plane.kubectl("apply", "-k", str(REPO / "deploy"))
    return plane
