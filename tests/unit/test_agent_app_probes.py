"""ISTIO_KUBE_APP_PROBERS as the agent reads it: Istio's JSON, checked before any probe runs.

What the variable says becomes connections the agent makes, so whatever is not a
prober of this pod's app is left out with one warning (the agent still starts), and
only what is left is ever probed. The gRPC health call the agent speaks itself is
checked against grpcio's own message types.
"""

from __future__ import annotations

import json
import logging

import pytest
from grpc_health.v1 import health_pb2

from pilot.agent import grpc_health
from pilot.agent.app_probes import (
    MAX_PROBERS,
    MAX_PROBERS_BYTES,
    AppProber,
    Grpc,
    HttpGet,
    TcpSocket,
    probers_from_env,
)

POD = "198.18.0.2"


def _read(value: str) -> dict[str, AppProber]:
    return probers_from_env({"ISTIO_KUBE_APP_PROBERS": value}, POD)


def test_istios_three_forms() -> None:
    probers = _read(json.dumps({
        "/app-health/web/livez": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTPS",
                                  "httpHeaders": [{"name": "Host", "value": "web.local"}]},
                                  "timeoutSeconds": 3},
        "/app-health/web/readyz": {"tcpSocket": {"port": "8080", "host": POD}},
        "/app-health/web/startupz": {"grpc": {"port": 9090, "service": "web"}},
    }))  # fmt: skip
    assert probers == {
        "/app-health/web/livez": AppProber(
            HttpGet("/healthz", 8080, True, (("Host", "web.local"),)), 3.0
        ),
        "/app-health/web/readyz": AppProber(TcpSocket(8080), 1.0),
        "/app-health/web/startupz": AppProber(Grpc(9090, "web"), 1.0),
    }


@pytest.mark.parametrize(
    "value",
    [
        "x" * (MAX_PROBERS_BYTES + 1),
        "{not json",
        "[" * 60_000,  # under the size bound: the parser's own depth limit
        '["a list"]',
        json.dumps(
            {f"/app-health/c{n}/livez": {"tcpSocket": {"port": 1}} for n in range(MAX_PROBERS + 1)}
        ),
    ],
    ids=["huge", "malformed", "deep", "not-an-object", "too-many"],
)
def test_a_variable_that_is_not_probers_is_one_warning_and_nothing(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "pilot.agent"):
        assert _read(value) == {}
    [record] = caplog.records
    assert record.getMessage().startswith("ISTIO_KUBE_APP_PROBERS is ")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"httpGet": {"port": 15021}}, "port 15021 is the sidecar's own"),
        ({"tcpSocket": {"port": 15001}}, "port 15001 is the sidecar's own"),
        ({"grpc": {"port": 15020}}, "port 15020 is the sidecar's own"),
        ({"httpGet": {"port": 80, "host": "metadata.google.internal"}}, "is not this pod"),
        ({"tcpSocket": {"port": 80, "host": "10.0.0.1"}}, "host '10.0.0.1' is not this pod"),
        ({"httpGet": {"port": "http"}}, "port 'http' is not a port number"),
        ({"httpGet": {"port": 80, "path": "/a\r\nHost: evil"}}, "not an absolute path"),
        ({"httpGet": {"port": 80, "path": "http://evil/"}}, "not an absolute path"),
        ({"httpGet": {"port": 80, "scheme": "FILE"}}, "is not HTTP or HTTPS"),
        ({"httpGet": {"port": 80, "httpHeaders": [{"name": "a\nb", "value": ""}]}}, "not a token"),
        ({"httpGet": {"port": 80, "httpHeaders": [{"name": "a", "value": "\r\n"}]}}, "line break"),
        ({"httpGet": {"port": 80}, "tcpSocket": {"port": 80}}, "exactly one of"),
        ({"exec": {"command": ["sh"]}}, "exactly one of"),
        ({"httpGet": {"port": 80}, "timeoutSeconds": 3600}, "timeoutSeconds '3600': 1-60"),
    ],
)
def test_a_prober_that_connects_where_it_should_not_is_left_out(
    spec: dict[str, object], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = {"tcpSocket": {"port": 8080}}
    with caplog.at_level(logging.WARNING, "pilot.agent"):
        probers = _read(json.dumps({"/app-health/c/livez": spec, "/app-health/c/readyz": good}))
    assert list(probers) == ["/app-health/c/readyz"]
    [record] = caplog.records
    assert message in record.getMessage()
    assert "\n" not in record.getMessage() and "\r" not in record.getMessage()


def test_paths_are_istios_for_a_container_name(caplog: pytest.LogCaptureFixture) -> None:
    spec = {"tcpSocket": {"port": 8080}}
    paths = ["/app-health/../livez", "/healthz", "/app-health/c/livez\n", "/app-health/C/livez"]
    with caplog.at_level(logging.WARNING, "pilot.agent"):
        assert _read(json.dumps(dict.fromkeys(paths, spec))) == {}
    assert len(caplog.records) == len(paths)


def _frames(sent: bytes) -> list[tuple[int, int, bytes]]:
    """(type, flags, payload) of each HTTP/2 frame after the client preface."""
    assert sent.startswith(grpc_health.PREFACE)
    rest, frames = sent[len(grpc_health.PREFACE) :], []
    while rest:
        length = int.from_bytes(rest[:3], "big")
        frames.append((rest[3], rest[4], rest[9 : 9 + length]))
        rest = rest[9 + length :]
    return frames


@pytest.mark.parametrize("service", ["", "shop.Cart", "s" * 300])
def test_the_grpc_health_call_is_grpcs_own_message(service: str) -> None:
    frames = _frames(grpc_health.request("198.18.0.2:9090", service))
    assert [kind for kind, _, _ in frames] == [grpc_health.SETTINGS, grpc_health.HEADERS,
                                               grpc_health.DATA]  # fmt: skip
    assert b"/grpc.health.v1.Health/Check" in frames[1][2]
    data = frames[2][2]
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == len(data) - 5
    assert health_pb2.HealthCheckRequest.FromString(data[5:]).service == service
    for status, expected in ((1, True), (2, False), (0, False)):
        answer = health_pb2.HealthCheckResponse(status=status).SerializeToString()
        framed = b"\x00" + len(answer).to_bytes(4, "big") + answer
        assert grpc_health.serving(framed) is expected
