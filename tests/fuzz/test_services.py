"""Hostile but well-formed calls to CSDS, the CA, Health and server reflection."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import methods, strategies
from tests.fuzz.calls import Call
from tests.fuzz.conftest import fuzz_settings
from tests.fuzz.fuzzer import Fuzzer
from tests.fuzz.methods import Method

OTHERS = (methods.HEALTH_CHECK, methods.HEALTH_WATCH, *methods.REFLECTIONS)


@pytest.mark.parametrize("method", [methods.CSDS_FETCH, methods.CSDS_STREAM], ids=str)
@fuzz_settings(15)
@given(data=st.data())
def test_csds_matchers_break_nothing(
    file_fuzzer: Fuzzer, method: Method, data: st.DataObject
) -> None:
    file_fuzzer.check(data.draw(strategies.csds_call(method), label="call"))


@fuzz_settings(30)
@given(call=strategies.ca_call())
def test_csrs_break_nothing(kube_fuzzer: Fuzzer, call: Call) -> None:
    kube_fuzzer.check(call)


@pytest.mark.parametrize("method", OTHERS, ids=str)
@fuzz_settings(10)
@given(data=st.data())
def test_health_and_reflection_break_nothing(
    file_fuzzer: Fuzzer, method: Method, data: st.DataObject
) -> None:
    file_fuzzer.check(data.draw(strategies.hostile_call(method, ()), label="call"))
