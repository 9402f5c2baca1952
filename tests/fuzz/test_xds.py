"""Hostile but well-formed xDS: every stream and Fetch method, with and without tokens.

File mode fuzzes the protocol (type URLs, nonces, versions, names, storms, node
metadata of every shape). Kubernetes mode fuzzes what authentication adds: tokens
of every kind and node metadata that agrees or disagrees with them.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import methods, strategies
from tests.fuzz.conftest import fuzz_settings
from tests.fuzz.fuzzer import Fuzzer
from tests.fuzz.methods import Method
from tests.support.peers import VICTIM

FILE_CLAIMS = {"NAMESPACE": "default", "SERVICE_ACCOUNT": "fuzz"}
AUTHENTICATED = (methods.ADS_SOTW, methods.ADS_DELTA, methods.SDS_SOTW, methods.SDS_DELTA)


@pytest.mark.parametrize("method", methods.XDS_STREAMS + methods.FETCHES, ids=str)
@fuzz_settings(12)
@given(data=st.data())
def test_hostile_xds_breaks_nothing(
    file_fuzzer: Fuzzer, method: Method, data: st.DataObject
) -> None:
    clusters = file_fuzzer.target.clusters
    call = data.draw(strategies.hostile_call(method, clusters, FILE_CLAIMS), label="call")
    file_fuzzer.check(call)


@pytest.mark.parametrize("method", AUTHENTICATED, ids=str)
@fuzz_settings(10)
@given(data=st.data())
def test_hostile_xds_with_tokens_breaks_nothing(
    kube_fuzzer: Fuzzer, method: Method, data: st.DataObject
) -> None:
    clusters = kube_fuzzer.target.clusters
    call = data.draw(strategies.hostile_call(method, clusters, VICTIM.metadata), label="call")
    kube_fuzzer.check(call)
