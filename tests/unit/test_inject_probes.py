"""The app's probes moved to the agent's status port (15020), the originals handed to
the agent in ISTIO_KUBE_APP_PROBERS in Istio's shape."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pilot.inject.errors import InjectError
from pilot.inject.pod import inject
from pilot.inject.settings import InjectSettings
from tests.support.inject_pods import app_pod, probed_pod

SETTINGS = InjectSettings()


def _probers(injected: dict[str, Any]) -> dict[str, Any] | None:
    proxy = next(c for c in injected["spec"]["initContainers"] if c["name"] == "istio-proxy")
    for entry in proxy["env"]:
        if entry["name"] == "ISTIO_KUBE_APP_PROBERS":
            return dict(json.loads(entry["value"]))
    return None


def test_http_tcp_and_grpc_probes_move_to_the_status_port() -> None:
    injected = inject(probed_pod(), SETTINGS, namespace="shop")
    web = injected["spec"]["containers"][0]
    assert web["readinessProbe"] == {
        # The headers stay on the rewritten probe, as Istio's (and go to the agent too).
        "httpGet": {
            "path": "/app-health/web/readyz",
            "port": 15020,
            "scheme": "HTTP",
            "httpHeaders": [{"name": "X-Probe", "value": "1"}],
        },
        "periodSeconds": 7,
        "timeoutSeconds": 4,
    }
    assert web["livenessProbe"] == {
        "httpGet": {"path": "/app-health/web/livez", "port": 15020, "scheme": "HTTP"},
        "failureThreshold": 5,
    }
    assert web["startupProbe"] == {
        "httpGet": {"path": "/app-health/web/startupz", "port": 15020, "scheme": "HTTP"}
    }


def test_the_originals_go_to_the_agent_with_named_ports_resolved() -> None:
    assert _probers(inject(probed_pod(), SETTINGS, namespace="shop")) == {
        "/app-health/web/readyz": {
            "httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTPS",
                        "httpHeaders": [{"name": "X-Probe", "value": "1"}]},
            "timeoutSeconds": 4,
        },
        "/app-health/web/livez": {"tcpSocket": {"port": 8080}},
        "/app-health/web/startupz": {"grpc": {"port": 9090, "service": "health"}},
    }  # fmt: skip


def test_rewriting_can_be_turned_off() -> None:
    pod = probed_pod()
    pod["metadata"]["annotations"] = {"sidecar.istio.io/rewriteAppHTTPProbers": "false"}
    injected = inject(pod, SETTINGS, namespace="shop")
    assert injected["spec"]["containers"][0]["livenessProbe"] == {
        "tcpSocket": {"port": 8080},
        "failureThreshold": 5,
    }
    assert _probers(injected) is None


def test_exec_probes_and_probes_on_undeclared_names_stay() -> None:
    pod = app_pod()
    web = pod["spec"]["containers"][0]
    web["livenessProbe"] = {"exec": {"command": ["true"]}}
    web["readinessProbe"] = {"httpGet": {"path": "/", "port": "admin"}}
    injected = inject(pod, SETTINGS, namespace="shop")
    assert injected["spec"]["containers"][0]["livenessProbe"] == web["livenessProbe"]
    assert injected["spec"]["containers"][0]["readinessProbe"] == web["readinessProbe"]
    assert _probers(injected) is None


def test_a_native_sidecar_of_the_app_has_its_probes_moved_too() -> None:
    pod = app_pod(initContainers=[{"name": "log-shipper", "image": "registry.example/ls",
                                   "restartPolicy": "Always",
                                   "readinessProbe": {"tcpSocket": {"port": 24224}}}])  # fmt: skip
    probers = _probers(inject(pod, SETTINGS, namespace="shop"))
    assert probers == {"/app-health/log-shipper/readyz": {"tcpSocket": {"port": 24224}}}


@pytest.mark.parametrize(
    "probe",
    [
        {"httpGet": {"path": "/", "port": 0}},
        {"httpGet": {"path": "/", "port": 70000}},
        {"httpGet": {"path": "/", "port": True}},
        {"tcpSocket": {"port": [80]}},
        {"grpc": {"port": "grpc"}},
        {"httpGet": {"port": 80}, "tcpSocket": {"port": 80}},
        {"httpGet": "http://evil.example/"},
    ],
)
def test_hostile_probes_are_refused_without_headers(probe: dict[str, Any]) -> None:
    pod = app_pod()
    pod["spec"]["containers"][0]["livenessProbe"] = probe
    with pytest.raises(InjectError, match="container web livenessProbe"):
        inject(pod, SETTINGS, namespace="shop")


def _with_headers(headers: Any) -> dict[str, Any]:
    pod = app_pod()
    pod["spec"]["containers"][0]["livenessProbe"] = {
        "httpGet": {"path": "/live", "port": 8080, "httpHeaders": headers}
    }
    return pod


def test_headers_go_to_both_probes_as_given() -> None:
    headers = [{"name": "Host", "value": "web.shop"}, {"name": "X-Empty"},
               {"name": "Accept", "value": "text/plain;\tq=1"}]  # fmt: skip
    injected = inject(_with_headers(headers), SETTINGS, namespace="shop")
    spelled = [{"name": "Host", "value": "web.shop"}, {"name": "X-Empty", "value": ""},
               {"name": "Accept", "value": "text/plain;\tq=1"}]  # fmt: skip
    rewritten = injected["spec"]["containers"][0]["livenessProbe"]["httpGet"]
    assert rewritten["httpHeaders"] == spelled
    assert _probers(injected) == {
        "/app-health/web/livez": {
            "httpGet": {"path": "/live", "port": 8080, "httpHeaders": spelled}
        }
    }


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ("X-Probe: 1", "not a list of at most 16 headers"),
        ([{"name": f"X-{n}", "value": "1"} for n in range(17)], "not a list of at most 16"),
        (["X-Probe: 1"], "is not a header object"),
        ([{"value": "1"}], "None is not a header name"),
        ([{"name": "X-Probe\r\nX-Injected", "value": "1"}], "is not a header name"),
        ([{"name": "X Probe", "value": "1"}], "is not a header name"),
        ([{"name": "X-" + "a" * 127, "value": "1"}], "is not a header name"),
        ([{"name": "X-Probe", "value": "1\r\nX-Injected: yes"}], "header X-Probe: the value"),
        ([{"name": "X-Probe", "value": "caf\u00e9"}], "header X-Probe: the value"),
        ([{"name": "X-Probe", "value": "a" * 4097}], "header X-Probe: the value"),
        ([{"name": "X-Probe", "value": 1}], "header X-Probe: the value"),
    ],
)
def test_hostile_headers_are_refused_in_one_line(headers: Any, why: str) -> None:
    """A header reaches the kubelet's request and the agent's: one that could split a
    request, or that the agent would not send, is refused at injection, naming it."""
    with pytest.raises(InjectError) as refused:
        inject(_with_headers(headers), SETTINGS, namespace="shop")
    message = str(refused.value)
    assert message.startswith("container web livenessProbe httpGet.httpHeaders: "), message
    assert why in message and "\n" not in message and len(message) < 200, message


@pytest.mark.parametrize(
    "name", ['web","x":{"tcpSocket":{"port":15000}},"a', "../admin", "Web", "a" * 64, "web\n"]
)
def test_container_names_reaching_probe_paths_must_be_dns_labels(name: str) -> None:
    pod = probed_pod()
    pod["spec"]["containers"][0]["name"] = name
    with pytest.raises(
        InjectError, match=r"spec\.containers\[0\]\.name: .* is not a DNS-1123 label"
    ):
        inject(pod, SETTINGS, namespace="shop")
