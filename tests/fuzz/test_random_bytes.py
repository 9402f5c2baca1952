"""Random bytes (and valid requests with bytes flipped, cut or added) as every method's request."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import methods, strategies
from tests.fuzz.conftest import fuzz_settings
from tests.fuzz.fuzzer import Fuzzer
from tests.fuzz.methods import Method


@pytest.mark.parametrize("method", methods.ALL, ids=str)
@fuzz_settings(10)
@given(data=st.data())
def test_random_bytes_break_nothing(
    file_fuzzer: Fuzzer, method: Method, data: st.DataObject
) -> None:
    file_fuzzer.check(data.draw(strategies.raw_call(method), label="call"))
