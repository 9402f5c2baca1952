"""Two pilots for all of tests/fuzz, on one event loop thread: file mode and Kubernetes mode.

`file_fuzzer`: `--config` (a copy of examples/mesh.yaml), `--xds-auth none`.
`kube_fuzzer`: the test API server and `--xds-auth kubernetes`; calls carry ns-b/victim's
token unless an example says otherwise. `FUZZ` is the tests' Hypothesis settings:
derandomized (a failure reproduces), no example database, no deadline (an example
waits for a real process), a few examples per test (`FUZZ_EXAMPLES` scales them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.fuzz.fuzzer import Fuzzer
from tests.fuzz.loop import LoopThread
from tests.fuzz.target import start_target, stop_target

SCALE = float(os.environ.get("FUZZ_EXAMPLES", "1"))


def fuzz_settings(examples: int) -> settings:
    """Settings for a test of about `examples` examples (times FUZZ_EXAMPLES)."""
    return settings(
        max_examples=max(1, round(examples * SCALE)),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
            HealthCheck.filter_too_much,
        ],
    )


@pytest.fixture(scope="package")
def fuzz_loop() -> Iterator[LoopThread]:
    with LoopThread() as loop:
        yield loop


def _fuzzer(loop: LoopThread, folder: pytest.TempPathFactory, mode: str) -> Iterator[Fuzzer]:
    target = start_target(loop, folder.mktemp(f"fuzz-{mode}"), mode)
    try:
        yield Fuzzer(target)
    finally:
        stop_target(target)


@pytest.fixture(scope="package")
def file_fuzzer(
    fuzz_loop: LoopThread, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fuzzer]:
    yield from _fuzzer(fuzz_loop, tmp_path_factory, "file")


@pytest.fixture(scope="package")
def kube_fuzzer(
    fuzz_loop: LoopThread, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fuzzer]:
    yield from _fuzzer(fuzz_loop, tmp_path_factory, "kube")
